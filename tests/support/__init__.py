"""What the tests share: forking ranks (``harness``), numpy references (``reference``), the collective
matrices and failure scenarios several transports run (``matrices``, ``scenarios``), network namespaces
(``netns``) and the torch helpers (``torch_harness``)."""
