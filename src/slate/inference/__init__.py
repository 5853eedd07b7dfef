"""Using a trained model: the model files, reading and scoring a file, ``slate predict`` and
``slate evaluate``, calibration, and ``slate export``."""
