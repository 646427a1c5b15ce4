from tiering.cli.main import main

raise SystemExit(main())
