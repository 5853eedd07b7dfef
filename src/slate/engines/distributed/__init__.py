"""The distributed engine, one process per party on ``torch.distributed``
(:class:`~slate.engines.distributed.engine.DistributedEngine`).

Two planes: ``wire/`` carries the parties' data (gossip and collectives, sealed messages, JSON
facts, the hello of each process group), ``control/`` decides who is in the run (the rendezvous
store's records, sessions, liveness, the lookout, failures, the agreement on lost and returning
parties, start-up and the launcher). ``wire/`` may use ``control/`` (a failed exchange is named
by its failure handling); ``control/`` uses ``wire/`` only where a start waits for the hello
(``start_up``).
"""
