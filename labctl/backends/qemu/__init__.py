"""The embedded backend: labctl starts ``qemu-system-x86_64`` itself (:mod:`.backend`),
from a command line built by pure functions (:mod:`.argv`)."""
