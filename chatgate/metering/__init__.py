"""Usage metering: the recorder, token counts, prices, reports, metrics and the stores."""
