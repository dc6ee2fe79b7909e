"""What the applications (`jaxattn run`, `loop`, `sweep`, `bench`, `animate`, `view`,
the command line) write and read back, above the library: run folders (`folders`:
atomic files, the `INCOMPLETE` marker, locks, resumes), one figure style
(`figures`), movies of a trajectory (`animate`: `ja.animate`), the trajectories a
run folder saved (`trajectories`) and its one-page viewer (`view`). The library
below never imports it."""

from . import figures as figures
from . import folders as folders
