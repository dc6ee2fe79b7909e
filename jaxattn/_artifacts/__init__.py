"""What the applications (`jaxattn run`, `loop`, `sweep`, `bench`, `animate`, `view`)
write and read back, above the library: run folders, figures, movies, trajectories and
the viewer (modules: ARCHITECTURE.md). The library below never imports it.
"""

from . import figures as figures
from . import folders as folders
