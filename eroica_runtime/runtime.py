"""Placeholder until the online chain lands."""


class Runtime:
    @classmethod
    def start(cls) -> "Runtime":
        return cls()

    def on_step(self, manual: bool = False) -> None:
        pass
