"""The series as a static website: ``python -m website`` (see `website.build`)."""
