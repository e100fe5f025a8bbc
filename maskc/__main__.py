"""``python -m maskc``: the same command as the ``maskc`` console script."""
from .cli import main

if __name__ == "__main__":
    main()
