from tiering.cli import main

raise SystemExit(main())
