"""ecal: the energy-calculus command line (``ecal --help``)."""
