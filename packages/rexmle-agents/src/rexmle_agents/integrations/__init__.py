"""rexmle from other evaluation frameworks, and their results back into rexmle.

``inspect``: rexmle's tasks, sandbox and scorer registered with Inspect (``pip install rexmle-agents[inspect]``,
then ``inspect eval rexmle/<task>``), and ``rexmle import inspect LOG`` turning Inspect logs into run folders.
:mod:`.cli` holds the ``rexmle import`` verb, a group other frameworks add their own sub-command to.
"""
