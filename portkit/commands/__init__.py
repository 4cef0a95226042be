"""One module per subcommand; portkit/cli.py puts them together."""
