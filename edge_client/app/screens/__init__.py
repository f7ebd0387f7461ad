"""The app's screens, one module each, laid out with :mod:`edge_client.app.screens.layout` (all import Kivy).

==============  =========================================================================
``today``       the day's timeline, minutes against the weekly goal, relabelling, export
``record``      choose an activity, start and stop; windows recorded per activity
``live``        the activity the current model sees, with its confidence
``federation``  joining (by hand or by Enrol), the home server's state, what left the phone
``history``     weeks and months, undo and delete, quality over rounds, storage and settings
``chart``       the line chart of the History screen
==============  =========================================================================
"""

from edge_client.app.screens.federation import FederationScreen
from edge_client.app.screens.history import HistoryScreen
from edge_client.app.screens.live import LiveScreen
from edge_client.app.screens.record import RecordScreen
from edge_client.app.screens.today import TimelineBar, TodayScreen

__all__ = ["FederationScreen", "HistoryScreen", "LiveScreen", "RecordScreen", "TimelineBar", "TodayScreen"]
