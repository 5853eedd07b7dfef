"""Imported by the test processes' fork server (``tests/forked.py``'s ``PRELOAD``): the data that
most multi-site tests' sites read (scikit-learn's digits), read once in the server, so that each
forked site finds it already read, as every later read in one process does
(:func:`slate.data.datasets.digits_arrays`)."""

from slate.data.datasets import digits_arrays

digits_arrays()
