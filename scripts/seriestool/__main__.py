import os
import sys

# git's paths and patch text are UTF-8 bytes: in a locale that is not UTF-8
# (LC_ALL=C), run in Python's UTF-8 mode, so a path git prints names the same
# file to Python and compares equal to the manifest's.
if not sys.flags.utf8_mode and sys.getfilesystemencoding().lower() not in ("utf-8", "utf8"):
    os.execv(sys.executable, [sys.executable, "-X", "utf8", *sys.orig_argv[1:]])


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
