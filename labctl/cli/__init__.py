"""The command line: one thin module per command (argument parsing, output with
rich, ``--json``), the one place that prints, and :mod:`.main`, the one
place that turns labctl's errors into messages and exit codes. Everything
else is the library's; nothing in the library imports the CLI.
"""
