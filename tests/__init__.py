"""The test suite (a package, so that its sub-packages such as ``tests.kernels`` never shadow an installed
package of the same name, e.g. the ``kernels`` package transformers imports)."""
