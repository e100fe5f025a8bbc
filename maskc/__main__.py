"""``python -m maskc``: the same command as the ``maskc`` console script."""
from maskc.cli import main

if __name__ == "__main__":
    main()
