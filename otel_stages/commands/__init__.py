"""One module per ``otel-stages`` subcommand: ``add_arguments(parser)`` and ``run(args) -> int``."""
