from labctl.cli.main import main

raise SystemExit(main())
