"""A run: its flags checked, its state (:class:`~slate.training.run.Run`), the training loop
(:func:`slate.training.loop.train`), evaluation, checkpoints, changes of the party set, the run
folder, and one party's process of a distributed run."""
