import sys


def _main() -> int:
    # A Ctrl-C before the commands take over signals (while the modules are
    # imported, or outside any step that defers it) ends the tool as
    # ``interrupts.Interrupted`` does: one line and 128 + SIGINT, no traceback.
    try:
        from .cli import main

        return main()
    except KeyboardInterrupt:
        print("error: interrupted by SIGINT", file=sys.stderr)
        return 130


sys.exit(_main())
