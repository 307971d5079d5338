"""Stand-in for an ``amdsmi`` installed without its library (``libamd_smi.so``).

``measure.campaign.import_ray`` puts this folder's parent first on ``PYTHONPATH`` for the Ray
processes a local ``--ray`` cluster starts, only when the real ``amdsmi`` fails to import with
something other than ImportError (it raises KeyError when its library is missing, and Ray
imports it in every process). Ray then treats AMD GPUs as absent. It is shipped with the
package (never written at run time), so it is exactly as trusted as the code that uses it.
"""

raise ImportError("amdsmi is installed but libamd_smi.so is not (stand-in from energy-calculus; "
                  "pip uninstall amdsmi removes the need for it)")
