from labctl.cli import main

raise SystemExit(main())
