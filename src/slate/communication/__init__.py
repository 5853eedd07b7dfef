"""Talking less: compression operators, CHOCO-SGD's compressed gossip, the gossip flags
(:class:`~slate.communication.gossip.GossipSettings`) and the WAN time model. Engines build on it;
it knows no engine."""
