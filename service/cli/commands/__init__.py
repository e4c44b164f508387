"""One module per group of `lifelong` subcommands; each has `register(commands)`."""
