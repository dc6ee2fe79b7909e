"""What the applications (`jaxattn run`, `loop`, `sweep`, `bench`, the command line)
share above the library: run folders (`folders`: atomic files, the `INCOMPLETE`
marker, locks, resumes) and one figure style (`figures`). The library below never
imports it."""

from . import figures as figures
from . import folders as folders
