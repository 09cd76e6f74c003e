"""python -m gpuhook.runtime: the create path, as the sh front runs it without a bundle."""

from . import main

main()
