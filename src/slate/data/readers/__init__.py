"""Readers: from a file on disk to arrays or a :class:`~slate.data.readers.table.RawTable`.

They know nothing of a run's config; :mod:`slate.data.sources` calls them.
"""
