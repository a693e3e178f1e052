"""The `rdmadev` command line: doctor, demo, serve and plan (cli dispatches)."""
