"""The command line: one module per command, errors printed only here."""
