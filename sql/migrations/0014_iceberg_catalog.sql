-- The Iceberg SQL catalog's two tables (pyiceberg's SqlCatalog, in the layout of Iceberg's JDBC catalog, its
-- "v1" schema), made by the schema instead of by the first table sync, so that a metadata export carries a
-- topic's table with it: the catalog row is what points an engine at the table's current metadata file, and
-- `tiering.topic_table` mirrors it. They are where the catalog finds them: unqualified, through the search_path
-- of the role that connects. So each is created only when no table of its name is visible there (as pyiceberg
-- probes and creates them), and a catalog made before this migration, in any schema of the search_path, is
-- kept as it is: given only the `iceberg_type` column when it lacks it, as pyiceberg's v1 mode adds it.
DO $$
BEGIN
    IF to_regclass('iceberg_tables') IS NULL THEN
        CREATE TABLE iceberg_tables (
            catalog_name               varchar(255)  NOT NULL,
            table_namespace            varchar(255)  NOT NULL,
            table_name                 varchar(255)  NOT NULL,
            metadata_location          varchar(1000),
            previous_metadata_location varchar(1000),
            iceberg_type               varchar(5),
            PRIMARY KEY (catalog_name, table_namespace, table_name)
        );
    ELSIF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('iceberg_tables')
                                                    AND attname = 'iceberg_type' AND NOT attisdropped) THEN
        ALTER TABLE iceberg_tables ADD COLUMN iceberg_type varchar(5);
    END IF;
    IF to_regclass('iceberg_namespace_properties') IS NULL THEN
        CREATE TABLE iceberg_namespace_properties (
            catalog_name   varchar(255)  NOT NULL,
            namespace      varchar(255)  NOT NULL,
            property_key   varchar(255)  NOT NULL,
            property_value varchar(1000) NOT NULL,
            PRIMARY KEY (catalog_name, namespace, property_key)
        );
    END IF;
END
$$;
