"""The vocabulary every layer shares: the op IR (``ir``), SI unit strings
(``units``), checked settings (``fields``; ``field_docs``: each one's description,
the comment beside its field), a program as Chakra execution traces and back
(``chakra``, its schema in ``chakra_schema``, other tools' traces in
``chakra_foreign``, the one check of everything a trace says in
``chakra_checks``, the program's notes as JSON in ``chakra_notes``), strict readers of the files and
values a user writes (``user_files``), memory estimates that refuse what cannot
fit (``footprint``), the program's start (``clock``) and child processes that
leave with their parent (``processes``).

No SimPy, no other ``simulator`` package: ``workloads`` and ``topologies`` may
import this package and nothing else of ``simulator``.
"""
