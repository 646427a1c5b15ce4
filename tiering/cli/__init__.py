"""The `tiering` command, one module per concern, imports in one direction only:

    main  ->  topics, data, pipeline, verify, metadata (one per command family: parsers and handlers)
          ->  context (settings and clients, built once), output (text or JSON, chosen once), args (types)

`tiering.cli.main:main` is the console script and `python -m tiering`.
"""
