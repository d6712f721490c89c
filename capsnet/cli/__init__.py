"""The command-line application (imports the library; the library never imports it)."""
