"""Task families: code shared by the tasks of one competition (prepare + synthetic mirror)."""
