from flashbench.cli.app import entry

entry()
