-- The Iceberg SQL catalog's two tables (pyiceberg's SqlCatalog, in the layout of Iceberg's JDBC catalog, its
-- "v1" schema), made by the schema instead of by the first table sync, so that a metadata export carries a
-- topic's table with it: the catalog row is what points an engine at the table's current metadata file, and
-- `tiering.topic_table` mirrors it. Created where the catalog looks for them: unqualified, in the search_path
-- of the role that connects, as pyiceberg creates them; a catalog made before this migration is kept as it
-- is, and given the `iceberg_type` column pyiceberg itself adds when it finds it missing.
CREATE TABLE IF NOT EXISTS iceberg_tables (
    catalog_name               varchar(255)  NOT NULL,
    table_namespace            varchar(255)  NOT NULL,
    table_name                 varchar(255)  NOT NULL,
    metadata_location          varchar(1000),
    previous_metadata_location varchar(1000),
    iceberg_type               varchar(5),
    PRIMARY KEY (catalog_name, table_namespace, table_name)
);
ALTER TABLE iceberg_tables ADD COLUMN IF NOT EXISTS iceberg_type varchar(5);

CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (
    catalog_name   varchar(255)  NOT NULL,
    namespace      varchar(255)  NOT NULL,
    property_key   varchar(255)  NOT NULL,
    property_value varchar(1000) NOT NULL,
    PRIMARY KEY (catalog_name, namespace, property_key)
);
