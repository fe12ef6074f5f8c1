"""The parameter manager's node (AdaPM, seed 001, SPEC section 2): what one node holds and how it
trades keys with the others, with no thread, process or task of its own. ``node``: the parts under
one lock and the worker verbs (``Node``: ``pull``, ``push``, ``intent``, a round's requests and
answers); ``holdings``: an entry per key it owns, replicates or has intent for; ``routing``: where
keys it does not hold are; ``management``: a round's requests, answers and decisions (relocate or
replicate); ``messages``: what nodes send each other and the kinds they share; ``entries``: the
sparse per-key store under it all. The strategy family that runs nodes (threads or Ray actors, the
workers, Algorithm 1's timing) is ``cadence.strategies.adapm``; only its engine imports this.
"""
