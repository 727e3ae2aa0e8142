"""What the project publishes from its runs: the README's and docs' tables, regenerated from committed results
files (``posenc report``). Above the experiments, whose report modules render each table."""
