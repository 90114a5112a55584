"""Agent scaffolds: search policies (greedy/AIDE, MCTS/ML-Master, R&D loop) x operators (draft, debug, improve,
analyse, hypothesise, feedback), combined into the presets ``aide``, ``mcts`` and ``rdloop`` (:mod:`.presets`)."""
