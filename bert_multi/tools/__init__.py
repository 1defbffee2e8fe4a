"""Tools built on the layers below: speed side by side (``bench``), the framework-differences guide run
as code (``lessons``), and the golden fixtures (``fixtures``)."""
