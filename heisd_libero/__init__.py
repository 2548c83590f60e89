"""heisd_libero: the LIBERO workbench beside the heisd_ros node package (docs/eval_libero.md, docs/libero.md).

What the node does not need to run: the LIBERO environment, scripted expert and recorder (`sim`),
scripted demonstrations (`gen_demos`), the closed-loop evaluation and its reports (`eval_*`), the
mini VLA's training (`train_vla`, `dagger`, `publish_mini`) and the choice of verify-skip's checks
from an evaluation run (`skip_checks`). Its commands are `heisd-libero <command>` (`cli`). It
imports heisd_ros; heisd_ros imports it only where a node command optionally uses the simulator
(`heisd demo`'s LIBERO bag).
"""

__version__ = "0.1.0"
