"""The base of every v1 model, and the constrained scalar types they share."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, NoReturn

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)
from pydantic_core import PydanticCustomError

# Bounds that keep one message cheap to hold: the contract sets no limit, but a reporting
# interval of one rank never carries anywhere near this many operations or connections.
MAX_ITEMS = 65_536
MAX_ID_CHARS = 256

NonNegInt = Annotated[int, Field(ge=0, strict=True)]
Nanos = Annotated[int, Field(ge=0, strict=True, description="nanoseconds since the Unix epoch")]
PositiveInt = Annotated[int, Field(ge=1, strict=True)]
NonNegFloat = Annotated[float, Field(ge=0, strict=True)]
PositiveFloat = Annotated[float, Field(gt=0, strict=True)]
Score = Annotated[float, Field(ge=0, le=1, strict=True)]
Id = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS, strict=True)]
Text = Annotated[str, Field(strict=True)]


RULE_ERROR_TYPE = "c4_rule"
_RULE_TEMPLATE = "{path}: {detail}"


def broken_rule(path: str, detail: str) -> NoReturn:
    """Raise a cross-field rule violation, located (``path``) below the model checking it."""
    raise PydanticCustomError(RULE_ERROR_TYPE, _RULE_TEMPLATE, {"path": path, "detail": detail})


class C4Model(BaseModel):
    """Frozen, typed, unknown fields ignored; optional fields left out of the output when unset."""

    model_config = ConfigDict(
        frozen=True,
        extra="ignore",
        allow_inf_nan=False,
        validate_by_alias=True,
        validate_by_name=True,
        serialize_by_alias=True,
    )
    # Fields that may be absent on the wire; computed per class, None is then not written.
    _omittable: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._omittable = frozenset(
            (info.alias or name)
            for name, info in cls.model_fields.items()
            if not info.is_required() and info.default is None
        )

    @model_serializer(mode="wrap")
    def _leave_out_absent(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for name in self._omittable:
                if name in data and data[name] is None:
                    del data[name]
        return data
