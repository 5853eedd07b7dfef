"""slate's version, in a module of its own so that any module can read it without importing the
package's face (:mod:`slate`)."""

__version__ = "0.1.0"
