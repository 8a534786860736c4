"""`python -m layerdiff.analyzer.cli`: the `analyze` command."""
from layerdiff.analyzer.cli.app import main

raise SystemExit(main())
