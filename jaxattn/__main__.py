import os
import signal
import sys


def _quit(signum, frame):
    """A Ctrl-C while the command line loads: nothing to undo, exit status 130 (`main`
    takes Ctrl-C over from here: `jaxattn.cli.quit_on_sigint`)."""
    os.write(2, b"jaxattn: interrupted\n")
    os._exit(130)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, _quit)

from .cli import main  # noqa: E402

sys.exit(main())
