"""python -m gpuhook.runtime: the create path, as the front runs it without a site-packages dir of its own."""

from . import main

main()
