"""``python -m ecal`` is the same as ``ecal``."""

from .cli import main

raise SystemExit(main())
