"""The `static-compiler` command line: an application on top of the library.

    static-compiler COMMAND ...           (the console script)
    python -m static_compiler.cli COMMAND ...

Layout: `dispatch` builds the parser from `dispatch.SUBCOMMANDS` and runs
`main`; each subcommand is one module (`show_ir`, `compile`, `decode`,
`verify`, `demo`) holding a `COMMAND` row (`common.Subcommand`); `main_job`
is the main job behind `demo`; `demo_model` is the demo model and the
serving-process entry point (`python -m static_compiler.cli.demo_model`).

Internal: every module (the command line is the interface; `main` here is
the console script's entry point).

This file imports nothing, so the serving process, which imports this
package on its way to `demo_model`, loads no compiler code through it.
"""


def main(argv=None) -> int:
    """Entry point of the console script; returns the exit status (argv
    defaults to sys.argv[1:]; argparse itself exits 2 on bad flags)."""
    from static_compiler.cli import dispatch

    return dispatch.main(argv)
