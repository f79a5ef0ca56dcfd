from preflight.cli import main

raise SystemExit(main())
