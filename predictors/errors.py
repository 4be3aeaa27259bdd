"""The one exception type for bad user input (files, values, settings).

Every message names what was wrong, where (file, row, column or field) and what to do. The CLI prints it as a
single line and exits with status 2; nothing is written when it is raised.
"""


class InputError(ValueError):
    """Bad input from a user: a file, a curve, a setting. The message is one line and says where."""
