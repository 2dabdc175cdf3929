"""The `dpr` command line: one typer app per command group, thin commands over service functions."""
