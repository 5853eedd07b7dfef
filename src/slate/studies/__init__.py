"""The paper's studies, built on ordinary ``slate train`` runs, beside the library rather than in
it: the library never imports them, only the ``slate reproduce`` command does.

``reproduce`` (Table 2, Figures 1-2 and the ablation of Tables 3-4, and the presets of
``configs/``), ``claims`` (the theoretical claims measured) and ``communication`` (what each way
of talking less costs in AP).
"""
