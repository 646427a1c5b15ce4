from tiering.cli.main import entry

entry()
