"""The Federation screen: how the device joins (by hand or from an enrolment bundle), its state, and what left it."""

from __future__ import annotations

import logging
import threading
from typing import Any

from kivy.metrics import dp
from kivy.uix.boxlayout import BoxLayout
from kivy.uix.button import Button
from kivy.uix.label import Label
from kivy.uix.popup import Popup
from kivy.uix.screenmanager import Screen
from kivy.uix.spinner import Spinner
from kivy.uix.switch import Switch
from kivy.uix.textinput import TextInput

from edge_client.app.controller import APP_BACKENDS, AppConfig, FederationView, taking_part_words
from edge_client.app.scanner import start_scan
from edge_client.app.screens.layout import ERROR_COLOUR, note, on_ui, row, scrolled, show_note, title, wrapped
from edge_client.app.words import is_bundle_text
from edge_client.leave import leave_words
from edge_client.sent_log import sent_words
from har_io.enrolment import EnrolmentRefused

log = logging.getLogger("fedhar.app")

LEAVE_COLOUR = (0.8, 0.25, 0.2, 1)
"""Background (RGBA) of the buttons that leave the federation."""

LEAVE_QUESTION = (
    "This phone stops training and tells the server it left. Its broker password, certificate and local model "
    "are deleted; your recorded activities and the Today timeline stay. To join again you need a new bundle."
)
"""The confirmation's words: what leaving does, what goes and what stays."""

class FederationScreen(Screen):
    """Settings of the federation (entered by hand or by Enrol), the connection state and every failure in words.

    Parameters
    ----------
    app : FedHarApp
        The app (its ``controller`` takes the settings; its ``footer`` names the device).
    cfg : AppConfig
        The settings the fields start from.
    """

    def __init__(self, app: Any, cfg: AppConfig, **kw: Any):
        super().__init__(name="federation", **kw)
        self.app = app
        root = BoxLayout(orientation="vertical", padding=dp(10), spacing=dp(3))
        root.add_widget(title("Federation"))
        self.why = wrapped("", 44)
        root.add_widget(self.why)
        self.server = note()  # the home server's state in words (edge_client.server_state)
        root.add_widget(self.server)
        # Taking part first: the switch a person looks for is at the top of every window size.
        self.take_part = Switch(active=False)
        self.take_part.bind(active=lambda _w, on: app.controller.set_take_part(on))
        root.add_widget(row("Take part in training", self.take_part, 36))
        self.charge_only = Switch(active=True)
        self.charge_only.bind(active=lambda _w, on: app.controller.set_charge_only(on))
        root.add_widget(row("Train only while charging", self.charge_only, 36))
        self.state = Label(text="off")
        root.add_widget(row("Connection", self.state, 34))
        self.error = note(ERROR_COLOUR)  # why the device does not connect or train, under the switch and the state
        root.add_widget(self.error)
        enrol_row = BoxLayout(size_hint_y=None, height=dp(36), spacing=dp(4))
        self.bundle = TextInput(multiline=False, write_tab=False, font_size="13sp", hint_text="bundle file, or paste its text")
        # A pasted bundle holds the device's password: masked as soon as it is bundle text, never readable.
        self.bundle.bind(text=lambda w, text: setattr(w, "password", is_bundle_text(text)))
        enrol_row.add_widget(self.bundle)
        self.enrol_button = Button(text="Enrol", size_hint_x=None, width=dp(64))
        self.enrol_button.bind(on_release=lambda *_: self.enrol())
        enrol_row.add_widget(self.enrol_button)
        self.scan_button = Button(text="Scan QR", size_hint_x=None, width=dp(76))
        self.scan_button.bind(on_release=lambda *_: self.scan())
        enrol_row.add_widget(self.scan_button)
        root.add_widget(enrol_row)
        self.enrol_row = enrol_row
        self.enrol_error = note(ERROR_COLOUR)  # a refused bundle or scan, right under the Enrol row
        root.add_widget(self.enrol_error)
        self.left = wrapped("", 0)  # after leaving: what was done, under the Enrol row
        root.add_widget(self.left)

        def field(label: str, **opts: Any) -> TextInput:
            box = TextInput(multiline=False, write_tab=False, font_size="15sp", **opts)
            root.add_widget(row(label, box, 36))
            return box

        self.client_id = field("Client id", text=cfg.client_id)
        self.broker = field("Broker", text=cfg.broker, hint_text="host:port")
        self.federation_name = field("Federation", text=cfg.federation)
        self.username = field("User name", text=cfg.username or "", hint_text="none: anonymous")
        self.password = field("Password", text="", password=True, hint_text="not set")
        self.tls_ca = field("CA certificate", text=str(cfg.tls_ca or ""), hint_text="path of ca.crt (empty: no TLS)")
        self.backend = Spinner(text=cfg.backend, values=APP_BACKENDS, size_hint_y=None, height=dp(36))
        root.add_widget(row("Training backend", self.backend, 36))
        self.apply_button = apply = Button(text="Apply", size_hint_y=None, height=dp(40))
        apply.bind(on_release=lambda *_: self.apply())
        root.add_widget(apply)
        self.apply_error = note(ERROR_COLOUR)  # a field the settings refuse, right under Apply
        root.add_widget(self.apply_error)
        self.round = Label(text="-")
        root.add_widget(row("Current round", self.round, 34))
        self.accuracy = Label(text="-")
        root.add_widget(row("Last local accuracy", self.accuracy, 34))
        self.model = Label(text="-")
        root.add_widget(row("Shared model it started from", self.model, 34))
        self.charging = Label(text="")
        root.add_widget(row("Charging", self.charging, 30))
        privacy = wrapped("[b]What left this phone[/b]: raw sensor data never does; only one model update a round", 44)
        privacy.markup = True
        root.add_widget(privacy)
        self.sent = wrapped("nothing yet: no round taken part in", 30)
        root.add_widget(self.sent)
        cost_title = wrapped("[b]What it costs this phone[/b]", 30)
        cost_title.markup = True
        root.add_widget(cost_title)
        self.cost = wrapped("", 30)
        root.add_widget(self.cost)
        self.leave_button = Button(text="Leave the federation", size_hint_y=None, height=dp(40), background_color=LEAVE_COLOUR)
        self.leave_button.bind(on_release=lambda *_: self.confirm_leave())
        root.add_widget(self.leave_button)
        self.view = scrolled(root)
        self.add_widget(self.view)
        self.leave_popup: Popup | None = None
        self._enrol_error_round: int | None = None  # the round when the Enrol row's error came: a later good round clears it

    def confirm_leave(self) -> None:
        """Ask before leaving: what goes and what stays, a switch to ask the server to forget this device, Leave or Cancel."""
        box = BoxLayout(orientation="vertical", padding=dp(8), spacing=dp(8))
        box.add_widget(wrapped(LEAVE_QUESTION, 118))
        self.forget_switch = Switch(active=False)
        box.add_widget(row("Also ask the server to forget this phone", self.forget_switch, 52))
        buttons = BoxLayout(size_hint_y=None, height=dp(44), spacing=dp(8))
        self.leave_cancel = Button(text="Cancel")
        self.leave_confirm = Button(text="Leave", background_color=LEAVE_COLOUR)
        buttons.add_widget(self.leave_cancel)
        buttons.add_widget(self.leave_confirm)
        box.add_widget(buttons)
        self.leave_popup = popup = Popup(title="Leave the federation?", content=box, size_hint=(0.94, None), height=dp(300),
                                         auto_dismiss=False)  # fmt: skip
        self.leave_cancel.bind(on_release=lambda *_: popup.dismiss())
        self.leave_confirm.bind(on_release=lambda *_: self.leave(self.forget_switch.active))
        popup.open()

    def leave(self, forget: bool) -> None:
        """Leave (the controller's :meth:`~edge_client.app.controller.DeviceController.leave`) in a background thread:
        asking the broker may take seconds, and the window must not freeze meanwhile."""
        self.leave_confirm.disabled = self.leave_cancel.disabled = True
        self.leave_confirm.text = "Leaving..."
        client_id = self.app.controller.cfg.client_id

        def run() -> None:
            try:
                words = leave_words(self.app.controller.leave(forget), client_id)
            except OSError as exc:  # a file that cannot be deleted: said, never a crash
                words = f"Leaving did not finish: {exc}. Training is stopped; try again, or clear the app's data."
            except Exception as exc:  # the window must outlive any failure; the log has the traceback
                log.exception("leaving the federation")
                words = f"Leaving did not finish: {type(exc).__name__}: {exc}"
            on_ui(self._left)(words)

        threading.Thread(target=run, name="leave", daemon=True).start()

    def _left(self, words: str) -> None:
        """After leaving: the Enrol row at the top of this screen, with what was done above it."""
        if self.leave_popup is not None:
            self.leave_popup.dismiss()
            self.leave_popup = None
        self.take_part.active = False
        self.load(self.app.controller.federation)
        self.bundle.hint_text = "left: enrol with a new bundle file, or paste its text"
        self.left.text = words
        self.left.height = dp(104)
        self.app.show("federation")
        self.view.scroll_y = 1

    def load(self, v: FederationView) -> None:
        """Fill the fields from the settings in force (the password is never shown: only whether one is stored)."""
        self.client_id.text = v.client_id
        self.broker.text = v.broker
        self.federation_name.text = v.federation
        self.username.text = v.username or ""
        self.tls_ca.text = v.tls_ca or ""
        self.backend.text = v.backend
        self.password.text = ""
        self.password.hint_text = "stored (hidden)" if v.password_set else "not set"

    def apply(self) -> None:
        """Hand the typed settings to the controller; a field it refuses is named right under Apply."""
        fields: dict[str, Any] = {
            "client_id": self.client_id.text,
            "broker": self.broker.text,
            "federation": self.federation_name.text,
            "username": self.username.text,
            "tls_ca": self.tls_ca.text,
            "backend": self.backend.text,
        }
        if self.password.text:
            fields["password"] = self.password.text
        try:
            self.app.controller.set_federation(**fields)
        except ValueError as exc:
            show_note(self.apply_error, str(exc))
            return
        show_note(self.apply_error, "")  # its cause is gone: the settings were taken
        self.load(self.app.controller.federation)

    def _enrol_failed(self, text: str) -> None:
        """Show why Enrol or Scan QR failed, right under their row; a good enrolment or a later good round clears it."""
        self._enrol_error_round = self.app.controller.federation.round
        show_note(self.enrol_error, text)

    def enrol(self, text: str | None = None) -> None:
        """Take the bundle typed, pasted or scanned: every field filled from it, or its refusal shown under the Enrol row."""
        source = (self.bundle.text if text is None else text).strip()
        if not source:
            self._enrol_failed("enrol: give the bundle's file (fedhar-coordinator enrol NAME wrote it), or paste its text")
            return
        pasted = is_bundle_text(source)
        if pasted:  # parsed now, whatever the outcome: the text (password included) leaves the field
            self.bundle.text = ""
        try:
            b = self.app.controller.enrol(source, ca_file=self.tls_ca.text.strip() or None)
        except EnrolmentRefused as exc:
            if pasted:
                self.bundle.hint_text = "the pasted bundle was refused (see below); paste a new one"
            self._enrol_failed(str(exc))
        except OSError as exc:
            self._enrol_failed(f"enrol: cannot read the bundle {source}: {exc.strerror or exc}")
        else:
            self.bundle.text = ""  # it holds the password
            self.bundle.hint_text = f"enrolled with {b.coordinator}: {b.client_id} in {b.federation}"
            show_note(self.enrol_error, "")
            show_note(self.apply_error, "")
            self.load(self.app.controller.federation)

    def scan(self) -> None:
        """Scan the bundle's QR code with the phone's scanner app; off Android, say why not (under the Enrol row)."""
        why = start_scan(on_ui(self._scanned))
        if why is not None:
            self._enrol_failed(why)

    def _scanned(self, text: str | None) -> None:
        if text is None:
            self._enrol_failed("QR scan cancelled")
            return
        self.enrol(text)

    def show(self, v: FederationView) -> None:
        """Show the controller's newest :class:`~edge_client.app.controller.FederationView`."""
        state = v.state
        if v.retry_in_s is not None:
            state = f"{state}, retry in {v.retry_in_s:.0f} s"
        self.state.text = state
        self.round.text = "-" if v.round is None else str(v.round)
        self.accuracy.text = "-" if v.last_accuracy is None else f"{v.last_accuracy * 100:.1f} %"
        self.model.text = "-" if v.model_version is None else f"v{v.model_version} (the server's numbering)"
        self.charging.text = "yes" if v.charging else "no"
        self.password.hint_text = "stored (hidden)" if v.password_set else "not set"
        self.error.text = v.error  # not scrolled to: the person may be typing further down
        self.why.text = why = taking_part_words(v)
        self.server.text = "" if v.server in why else v.server  # said once: in the sentence of why, or on its own line
        if self.enrol_error.text and v.state in ("connected", "training") and v.round is not None and v.round != self._enrol_error_round:
            show_note(self.enrol_error, "")  # a round went well since: whatever Enrol or Scan QR said is past
        lines = sent_words(v.sent, v.round)
        self.sent.text = "\n".join(lines) if lines else "nothing yet: no round taken part in"
        self.sent.height = dp(38) * max(1, len(lines))
        self.cost.text = "\n".join(v.cost)
        self.cost.height = dp(38) * max(1, len(v.cost))
        self.app.footer.text = f"{v.client_id} - sensor: {self.app.sensor_name}"
