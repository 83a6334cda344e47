"""The one error type raised for bad GGUF input."""


class GGUFError(ValueError):
    """A GGUF file is missing, malformed, or does not describe a GLM-5 (glm-dsa) model.

    The message is always a single line naming the file and the tensor or metadata key involved,
    what was expected and what was found.
    """

    def __init__(self, message: str):
        # Keep the one-line promise even when a caller interpolates multi-line text.
        super().__init__(" ".join(str(message).split("\n")))
