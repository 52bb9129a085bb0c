"""accdbg's fault zoo: real models from PyPI packages with planted, known culprits.

``models`` finds and prepares the models, ``inputs`` renders their inputs, ``plant`` plants
the faults (each records the layers a ranking must name), ``runner`` runs accdbg's
algorithms on each case and ``scoring`` turns their tables into hit@k figures.
"""
